import pytest

from controlplane.policy.conditions import XidCondition
from controlplane.policy.detectors.xid import classify_xid, detect_xid
from controlplane.policy.snapshot import GpuReading
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


UNKNOWN = XidCondition.model_validate({"detector": "xid", "blast_radius": "unknown", "within": "15m"})


def two_codes_gpu(first: int, then: int, at_first: float = 3300, at_then: float = 3330):
    """Two XIDs within the window, each read in its own report: the agent's ``xids`` carry the codes."""
    def total(t: float) -> int:
        return 1 + (t >= at_first) + (t >= at_then)

    history = [GpuReading(at=r.at, xid_events_total=r.xid_events_total,
                          xids=(first,) if r.at == at(at_first) else (then,) if r.at == at(at_then) else ())
               for r in gpu_readings(3600, interval=30, xid_events_total=total)]
    return gpu(history=history, xid_events_total=3, last_xid=then)


def test_hardware_xid_followed_by_an_application_xid_still_fires_the_hardware_condition():
    g = two_codes_gpu(79, 45)
    finding = detect_xid(HW, g, at(3600))
    assert finding is not None and finding.measured["xid"] == 79 and finding.measured["blast_radius"] == "hardware"
    assert finding.measured["events"] == 2 and finding.measured["xids"] == "79, 45"
    assert "fallen off the bus" in finding.summary and "XIDs 79, 45" in finding.summary
    # The application XID is the failing GPU's fallout: no restart there, the hardware policy cordons it.
    assert detect_xid(APP, g, at(3600)) is None


def test_two_codes_in_one_report_are_both_classified():
    history = gpu_readings(3600, interval=30, xid_events_total=lambda t: 3 if t >= 3300 else 1)
    history = [GpuReading(at=r.at, xid_events_total=r.xid_events_total, xids=(48, 13) if r.at == at(3300) else ())
               for r in history]
    g = gpu(history=history, xid_events_total=3, last_xid=13)
    assert detect_xid(HW, g, at(3600)).measured["xid"] == 48
    assert detect_xid(UNKNOWN, g, at(3600)) is None


def test_an_unknown_code_beside_an_application_one_alerts_and_the_application_one_restarts():
    g = two_codes_gpu(13, 999)
    assert detect_xid(APP, g, at(3600)).measured["xid"] == 13
    assert detect_xid(UNKNOWN, g, at(3600)).measured["xid"] == 999
    assert detect_xid(HW, g, at(3600)) is None


def test_codes_older_than_the_window_are_not_classified():
    g = two_codes_gpu(79, 13, at_first=600, at_then=3330)
    assert detect_xid(HW, g, at(3600)) is None
    assert detect_xid(APP, g, at(3600)).measured["xid"] == 13


def test_an_agent_without_xids_is_judged_on_its_last_code():
    g = xid_gpu(48, rise_at=3300)  # readings carry counts only, as an agent that predates ``xids`` sends them
    assert detect_xid(HW, g, at(3600)).measured["xid"] == 48
