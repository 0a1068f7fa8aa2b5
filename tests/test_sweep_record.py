"""A sweep's record on this machine (trainer/sweeps/record.py): one shape for a sweep run here and one run in the
cluster, the files earlier versions wrote still read, a damaged one refused with the fix, written atomically."""

from __future__ import annotations

import json

import pytest

from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.trainer.sweeps.record import KUBERNETES, LOCAL, RECORD_FILE, SweepRecord


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    return tmp_path


def written(home, name: str, raw: dict) -> None:
    directory = home / "sweeps" / name
    directory.mkdir(parents=True)
    (directory / RECORD_FILE).write_text(json.dumps(raw))


def test_a_sweep_this_machine_never_started_has_an_empty_record(home):
    record = SweepRecord.load("never")
    assert not record.started_here and not record.in_cluster and record.storage is None


def test_a_record_reads_back_as_written_and_leaves_no_temporary_file(home):
    record = SweepRecord(backend=KUBERNETES, kind="pytorchjob", team="vision", context="prod", source="/s/sweep.yaml",
                         stack="/s/Pulumi.prod.yaml")
    record.save("clf")
    assert SweepRecord.load("clf") == record
    assert [p.name for p in (home / "sweeps" / "clf").iterdir()] == [RECORD_FILE]


@pytest.mark.parametrize("raw, expected", [
    ({"storage": "sqlite:////h/sweeps/a/study.db", "backend": "local", "kind": "trainjob", "team": "vision",
      "source": "/s/a.yaml", "stack": None, "context": None},
     SweepRecord(backend=LOCAL, team="vision", source="/s/a.yaml", storage="sqlite:////h/sweeps/a/study.db")),
    ({"backend": "kubernetes", "kind": "trainjob", "team": "nlp", "context": None, "source": "/s/b.yaml", "stack": "/s/st.yaml"},
     SweepRecord(backend=KUBERNETES, team="nlp", source="/s/b.yaml", stack="/s/st.yaml")),
    ({"backend": "local", "source": "/s/c.yaml", "written_by": "a later version"}, SweepRecord(source="/s/c.yaml")),
], ids=["local, as earlier versions wrote it", "cluster, as earlier versions wrote it", "a key this version does not know"])
def test_the_files_earlier_versions_wrote_still_read(home, raw, expected):
    written(home, "old", raw)
    assert SweepRecord.load("old") == expected


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_damaged_record_is_refused_with_the_fix(home, content):
    (home / "sweeps" / "bad").mkdir(parents=True)
    (home / "sweeps" / "bad" / RECORD_FILE).write_text(content)
    with pytest.raises(TrainforgeError) as refused:
        SweepRecord.load("bad")
    assert refused.value.exit_code == EXIT_FAILED
    assert "damaged" in str(refused.value) and "--resume" in str(refused.value)


def test_a_trials_facts_keep_the_keys_earlier_sweeps_stored():
    """Every sweep's database holds these keys: a sweep continued by this version reads what an earlier one wrote."""
    from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, fact_key, fact_of
    assert fact_key(7, TrialFact.STOPPED) == "trial.7.stopped" and fact_key(12, TrialFact.COST_USD) == "trial.12.cost_usd"
    assert StudyKey.FINISHED_BECAUSE == "finished_because" and StudyKey.EXTENDED == "extended"
    assert all(fact_of(fact_key(n, fact)) == (n, fact) for n in (0, 9_999) for fact in TrialFact)
    assert [fact_of(k) for k in ("spec", "trial.x.cost_usd", "trial.3.unknown", "trial.3", "trials.3.ran_s")] == [None] * 5
