"""Disaggregated prefill/decode workers: one OS process each, a coordinator in the serving process."""
