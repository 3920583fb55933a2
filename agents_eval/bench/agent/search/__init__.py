"""The agent benchmark's SLO-rate search and the SLO it searches under."""
