"""Certificates: a CA and a serving certificate, on disk or in a Secret."""
