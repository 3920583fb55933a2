"""The capacity controller's policy: the prefill/decode split, routing, alerts. Pure, torch-free, clock-injected
(the cluster simulator runs the same objects); `tune` is the one module here that reads a model config."""
