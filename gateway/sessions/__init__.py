"""Agent sessions between turns: the manager, the store (memory or Redis) and the one-turn-at-a-time lease."""
