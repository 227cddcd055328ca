"""Bulk prediction over files: `adalayers predict-files` (one process, resumable parts) and its Ray Data engine."""
