"""The policy: its model and the checks that name the offending field."""
