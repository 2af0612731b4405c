"""Kubernetes objects' fields, read and written: quantities, vendor resource names, other schedulers'
dialects, the decision record and the JSONPatch."""
