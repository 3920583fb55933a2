"""The serving process's side of the workers: the engine over them, their handles, pool, placement and launchers."""
