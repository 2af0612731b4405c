"""The values every layer speaks: nodes, GPUs, requests, snapshots, decisions."""
