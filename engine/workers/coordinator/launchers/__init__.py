"""Where workers run (`deployment.placement`): child processes of the serving process (`local`), or Ray
actors placed across a Ray cluster's nodes (`ray`, the optional `agentserve[ray]` extra)."""

from __future__ import annotations

from engine.workers.coordinator.handles import Launcher
from engine.workers.deployment import DeploymentSettings


def make_launcher(deployment: DeploymentSettings) -> Launcher:
    if deployment.placement == "ray":
        from engine.workers.coordinator.launchers.ray_actors import RayLauncher  # ray: only when asked

        return RayLauncher(deployment)
    from engine.workers.coordinator.launchers.local import LocalLauncher

    return LocalLauncher()
