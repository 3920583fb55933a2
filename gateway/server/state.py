"""What every request handler reaches through `request.app.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import AsyncLLMEngine, SamplingDefaults, ServingEngine, Tokenizer
from gateway.admission import AdmissionController, AdmissionQueue
from gateway.auth import KeyRing
from gateway.load_signals import LoadSignals
from gateway.metrics import Metrics
from gateway.ratelimit import RateLimiter
from gateway.sessions.manager import SessionManager
from gateway.settings import GatewaySettings
from gateway.upstream.engine import UpstreamEngine


@dataclass
class GatewayState:
    settings: GatewaySettings
    engine: AsyncLLMEngine
    tokenizer: Tokenizer
    sessions: SessionManager
    keyring: KeyRing
    limiter: RateLimiter
    admission: AdmissionController
    metrics: Metrics
    signals: LoadSignals
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # the model's, for what a request leaves unset
    draining: bool = False
    in_flight: int = 0  # API requests not yet fully answered
    websockets: dict[str, int] = field(default_factory=dict)  # principal -> open Responses WebSockets
    admission_queue: AdmissionQueue = field(init=False)  # the line in front of `admission`

    def __post_init__(self) -> None:
        self.admission_queue = AdmissionQueue(self.admission)

    @property
    def serving_engine(self) -> ServingEngine:
        """The engine behind the async front: its limits, validation and reports, read on the event loop."""
        return self.engine.engine

    @property
    def model_name(self) -> str:
        """The upstreams' model name when they serve, else the embedded model's."""
        return self.engine.served_model if isinstance(self.engine, UpstreamEngine) else self.settings.model_name

    @property
    def applies_masks(self) -> bool:
        """Whether sparse history masks reach attention: the embedded engine's only, never an upstream's."""
        return not isinstance(self.engine, UpstreamEngine)
