"""The agent benchmark's report: tables, plots, notes and the cost per session."""
