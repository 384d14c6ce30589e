import pytest

from controlplane.policy.conditions import XidCondition
from controlplane.policy.detectors.xid import classify_xid, detect_xid
from tests.policy.series import at, gpu, gpu_readings


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids_are_the_engines_fault(code):
    assert classify_xid(code) == "application"


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95])
def test_hardware_xids_are_the_devices_fault(code):
    assert classify_xid(code) == "hardware"


def test_unlisted_xid_is_unknown():
    assert classify_xid(999) == "unknown"


HW = XidCondition.model_validate({"detector": "xid", "blast_radius": "hardware", "within": "15m"})
APP = XidCondition.model_validate({"detector": "xid", "blast_radius": "application", "within": "15m"})


def xid_gpu(code: int, rise_at: float, duration: float = 3600.0):
    history = gpu_readings(duration, interval=30, xid_events_total=lambda t: 2 if t >= rise_at else 1)
    return gpu(history=history, xid_events_total=2, last_xid=code)


def test_new_hardware_xid_is_found_by_the_hardware_condition_only():
    g = xid_gpu(79, rise_at=3300)
    finding = detect_xid(HW, g, at(3600))
    assert finding is not None and finding.measured["blast_radius"] == "hardware"
    assert "fallen off the bus" in finding.summary
    assert detect_xid(APP, g, at(3600)) is None


def test_application_xid_is_found_by_the_application_condition():
    g = xid_gpu(13, rise_at=3300)
    assert detect_xid(APP, g, at(3600)) is not None
    assert detect_xid(HW, g, at(3600)) is None


def test_xid_older_than_the_window_is_history_not_news():
    g = xid_gpu(79, rise_at=600)
    assert detect_xid(HW, g, at(3600)) is None
