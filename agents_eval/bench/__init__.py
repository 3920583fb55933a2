"""One subpackage per benchmark (`agentserve bench <name>`)."""
