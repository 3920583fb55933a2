"""The TCP transport: DSCP-marked sockets and each connection's receive side."""
