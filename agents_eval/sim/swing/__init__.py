"""The think/act swing at cluster scale (`agentserve simulate --swing`): its runs and its report."""
