"""Where workers run (`deployment.placement`): child processes of the serving process (`local`), or Ray
actors placed across a Ray cluster's nodes (`ray`, the optional `agentserve[ray]` extra)."""

from __future__ import annotations

from engine.worker.deployment import DeploymentSettings
from engine.worker.handles import Launcher


def make_launcher(deployment: DeploymentSettings) -> Launcher:
    if deployment.placement == "ray":
        from engine.worker.launchers.ray_actors import RayLauncher  # ray: only when asked

        return RayLauncher(deployment)
    from engine.worker.launchers.local import LocalLauncher

    return LocalLauncher()
