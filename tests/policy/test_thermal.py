from controlplane.policy.conditions import ThermalCondition
from controlplane.policy.detectors.thermal import detect_thermal, temperature_limit
from tests.policy.series import at, gpu, gpu_readings

HOT = ThermalCondition.model_validate({"detector": "thermal", "margin_celsius": 5, "for": "2m"})


def test_limit_is_the_devices_own_slowdown_threshold_minus_the_margin():
    assert temperature_limit(HOT, gpu(slowdown_temperature_celsius=89.0)) == 84.0
    assert temperature_limit(HOT, gpu()) == 85.0  # no reading: the practitioners' 85 degC


def test_h200_sustained_above_its_limit_fires():
    g = gpu(slowdown_temperature_celsius=89.0, history=gpu_readings(300, temperature_celsius=86.0))
    finding = detect_thermal(HOT, g, at(300))
    assert finding is not None and finding.subject == "n1/0"
    assert finding.measured["limit_celsius"] == 84.0 and finding.measured["peak_celsius"] == 86.0


def test_same_temperature_is_fine_on_a_device_that_tolerates_more():
    g = gpu(slowdown_temperature_celsius=95.0, history=gpu_readings(300, temperature_celsius=86.0))
    assert detect_thermal(HOT, g, at(300)) is None


def test_short_spike_is_not_sustained():
    g = gpu(slowdown_temperature_celsius=89.0,
            history=gpu_readings(300, temperature_celsius=lambda t: 88.0 if t >= 240 else 70.0))
    assert detect_thermal(HOT, g, at(300)) is None


def test_thermal_throttling_counts_even_below_the_limit():
    g = gpu(slowdown_temperature_celsius=89.0,
            history=gpu_readings(300, temperature_celsius=80.0, throttle_reasons=["hw_thermal_slowdown"]))
    finding = detect_thermal(HOT, g, at(300))
    assert finding is not None and "hw_thermal_slowdown" in finding.summary


def test_power_capping_is_not_heat():
    g = gpu(slowdown_temperature_celsius=89.0,
            history=gpu_readings(300, temperature_celsius=80.0, throttle_reasons=["sw_power_cap"]))
    assert detect_thermal(HOT, g, at(300)) is None
