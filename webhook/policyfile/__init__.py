"""The policy file on disk: reading it, and the one holder that re-reads it when it changes."""
