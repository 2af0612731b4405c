"""Admission decisions: which pods are in scope, the rules, quotas, isolation, mutate and validate."""
