"""The engine loop: scheduler, queue policy, sequences, outputs, request validation, stats and sampling."""
