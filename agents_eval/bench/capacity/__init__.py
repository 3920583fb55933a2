"""`agentserve bench capacity`: the capacity controller's reallocation latency and p99 against fixed splits."""
