from controlplane.policy.conditions import EccCondition
from controlplane.policy.detectors.ecc import detect_ecc, ecc_increase
from tests.policy.series import at, gpu, gpu_readings

ECC = EccCondition.model_validate({"detector": "ecc", "within": "15m"})


def test_a_rise_within_the_window_is_found_with_its_count():
    g = gpu(history=gpu_readings(3600, interval=30, ecc_uncorrected_total=lambda t: 2 if t >= 3300 else 0))
    finding = detect_ecc(ECC, g, at(3600))
    assert finding is not None and finding.subject == "n1/0" and finding.detector == "ecc"
    assert finding.measured["errors"] == 2 and finding.measured["ecc_uncorrected_total"] == 2
    assert "2 uncorrected ECC error(s) on GPU 0 of n1 in 15m" in finding.summary
    assert finding.evidence and finding.evidence[-1].values["ecc_uncorrected_total"] == 2


def test_a_flat_count_is_old_news_even_when_not_zero():
    g = gpu(history=gpu_readings(3600, interval=30, ecc_uncorrected_total=lambda t: 3 if t >= 600 else 0))
    assert detect_ecc(ECC, g, at(3600)) is None
    assert detect_ecc(ECC, g, at(1000)) is not None  # while the rise was within the window


def test_a_reset_counts_from_zero_and_is_not_a_negative_rise():
    # 5 errors, then a GPU reset (back to 0) inside the window, then 1 new error: 1 counted, not -4.
    g = gpu(history=gpu_readings(3600, interval=30,
                                 ecc_uncorrected_total=lambda t: 5 if t < 3000 else 0 if t < 3400 else 1))
    assert ecc_increase(g.history, at(3600), 900) == 1
    assert detect_ecc(ECC, g, at(3600)).measured["errors"] == 1
    reset_only = gpu(history=gpu_readings(3600, interval=30, ecc_uncorrected_total=lambda t: 5 if t < 3000 else 0))
    assert detect_ecc(ECC, reset_only, at(3600)) is None


def test_without_a_baseline_the_whole_count_counts_and_missing_readings_are_skipped():
    young = gpu(history=gpu_readings(300, interval=30, ecc_uncorrected_total=1))
    assert ecc_increase(young.history, at(300), 900) == 1
    unreadable = gpu(history=gpu_readings(3600, interval=30, ecc_uncorrected_total=None))
    assert detect_ecc(ECC, unreadable, at(3600)) is None


def test_min_increase():
    two = EccCondition.model_validate({"detector": "ecc", "min_increase": 2})
    g = gpu(history=gpu_readings(3600, interval=30, ecc_uncorrected_total=lambda t: 1 if t >= 3300 else 0))
    assert detect_ecc(two, g, at(3600)) is None and detect_ecc(ECC, g, at(3600)) is not None
