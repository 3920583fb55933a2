"""Token pruning of observations on ingest, and its rules."""
