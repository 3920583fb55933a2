"""Admission control: the controller's policy against the SLOs (`controller`) and the line in front of it
(`queue`)."""

from gateway.admission.controller import HEADROOM, MIN_DERIVED_SLO_S, AdmissionController, AdmissionDecision
from gateway.admission.queue import AdmissionQueue

__all__ = ["HEADROOM", "MIN_DERIVED_SLO_S", "AdmissionController", "AdmissionDecision", "AdmissionQueue"]
