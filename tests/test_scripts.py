"""The README's benchmark scripts run (tiny sizes, one subprocess each): a script that no test
runs rots, and the command behind a README figure must keep working."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from baselines import registry
from burst.engine import CONFIGS
from burst.spawn import spawn

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("script", "args", "expect"), [
    ("bench_ring_compute.py", ["--seq-local", "64", "--worlds", "2", "--repeats", "1"],
     "ring compute per rank / ideal"),
    ("bench_window_plan.py", ["--world", "2", "--seq-local", "64", "--repeats", "1",
                              "--big", "8192"],
     "whole-sequence attention of one rank"),
    ("bench_engine_memory.py", ["--quick"], "forward attention FLOPs counted"),
    ("bench_methods.py", ["--tokens", "256", "--repeats", "1"], "max err vs fp64"),
    ("bench_precision.py", ["--worlds", "2", "--seeds", "1"],
         "worst GQA (8 query heads, 1 kv heads): max error"),
    ("bench_init.py", ["--config", "tiny", "--ranks", "1", "2"], "34,816"),  # tiny's matrices
    ("bench_spawn.py", ["--worlds", "2", "--repeats", "1"], "forkserver"),
    ("bench_err_ratio.py", ["--worlds", "2", "--seq-len", "64"], "zigzag_ring bf16 dK/dV"),
    ("bench_state_save.py", ["--world", "2", "--layers", "1", "--hidden", "64"], " sharded  load"),
])
def test_benchmark_script_runs(script, args, expect):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert expect in res.stdout, res.stdout[-3000:]


def _train(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--out", str(out),
                           "--seq-len", "64", "--dtype", "float64", "--save-every", "2", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out / "steps.jsonl").open())]


def _first_loss_with_documents(rank, world, cu):
    """The first loss of scripts/train.py's defaults on one rank, on a batch of documents
    ``cu``, with the attention masked to them and not."""
    import torch

    from baselines import registry
    from burst.engine import Trainer

    out = []
    for docs in (cu, None):
        tr = Trainer("tiny", attention=registry.get("burst"), attention_options={
            "layout": "zigzag"}, checkpointing="selective", dtype=torch.float64, lr=3e-3)
        out.append(tr.step(*tr.local_batch(64, seed=0, cu_seqlens=cu), cu_seqlens=docs))
    return out


def test_each_training_option_reaches_the_model(tmp_path, monkeypatch):
    """scripts/train.py: --window, --doc-len, --kv-heads and --weight-decay each change the
    losses of a plain run (an option the script parsed but never passed on would not), and a
    value the engine refuses stops the run before anything is written."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # spawned ranks import it by name
    train = importlib.import_module("train")

    def losses(name, *args):  # in this process, which saves a second start of torch per run
        train.main(["--out", str(tmp_path / name), "--world", "1", "--steps", "2",
                    "--seq-len", "64", "--dtype", "float64", *args])
        return [loss for _, loss in _losses(tmp_path / name)]

    # a start that failed before its first save does not bind the folder to its arguments
    run = tmp_path / "plain" / "run.json"
    run.parent.mkdir()
    run.write_text(json.dumps({"method": "ring", "lr": 0.5}))
    plain = losses("plain")
    # a run started before these options existed resumes with their defaults, and naming a
    # default (the model's K/V heads, the method's backward) names the same run
    old = {k: v for k, v in json.loads(run.read_text()).items()
           if k not in ("window", "doc_len", "kv_heads", "optimizer", "weight_decay")}
    # (and one written before the defaults were resolved: None where they were left)
    run.write_text(json.dumps({**old, "backward": None, "ranks_per_node": None}))
    same = ("--kv-heads", str(CONFIGS["tiny"].num_kv_heads), "--backward", "burst")
    assert losses("plain", "--steps", "3", *same)[:2] == plain
    # one recorded with a whole-sequence document, before that was resolved to no mask
    run.write_text(json.dumps({**json.loads(run.read_text()), "doc_len": 64}))
    assert losses("plain", "--steps", "3", "--doc-len", "100")[:2] == plain
    # every argument that changes results is the run's identity: a resume with another is
    # refused (one left out of run.json resumed silently: a mutation audit)
    for args, why in ((("--kv-heads", "4"), "kv_heads: 2 then, 4 now"),
                      (("--seed", "1"), "seed: 0 then, 1 now"),
                      (("--seq-len", "128"), "seq_len: 64 then, 128 now")):
        with pytest.raises(SystemExit, match=why):
            losses("plain", "--steps", "4", *args)
    for name, args in {"window": ("--window", "8"),
                       "local_global": ("--window", "8", "--global-every", "2"),
                       "gqa": ("--kv-heads", "4"),
                       "decay": ("--weight-decay", "0.5"), "sgd": ("--optimizer", "sgd"),
                       "lr": ("--lr", "0.1"), "seed": ("--seed", "1")}.items():
        got = losses(name, *args)
        # the optimizer acts after step 0; the mask, the K/V heads and the seed (weights and
        # data) change its loss already
        differs = (got[1] != plain[1] and got[0] == plain[0] if name in ("decay", "sgd", "lr")
                   else got[0] != plain[0])
        assert differs, (name, got, plain)
        if name == "local_global":  # one layer of two windowed: neither plain nor all local
            assert got[0] != losses("window", "--window", "8")[0], got
    # tokens/s per rank under data parallelism: the global batch of 2 replicas over 2 ranks
    losses("dp", "--world", "2", "--cp-degree", "1")
    got = json.loads((tmp_path / "dp" / "steps.jsonl").open().readline())
    assert (got["world"], got["cp"], got["dp"]) == (2, 1, 2)
    assert got["tokens_per_s"] * got["seconds"] == pytest.approx(64 * 2 / 2)
    # the double ring and the backward move other bytes, not other losses: each step logs
    # what rank 0's attention sent, equal to the byte formula of its layers, in all and across
    # nodes of 2 (a flat ring, or one without the right backward, sends other counts)
    runs = {(m, b): (f"{m}_{b}", "--world", "4", "--method", m,
                     *(("--ranks-per-node", "2", "--backward", b) if m == "burst" else ()))
            for m, b in (("burst", "burst"), ("burst", "ring"), ("double_ring", None))}
    # (double_ring, LoongTrain's, runs on nodes of 2 by default: its log must know them)
    double = {key: losses(*args) for key, args in runs.items()}
    first = double[("burst", "burst")]
    for got in double.values():
        assert max(abs(a - b) for a, b in zip(got, first, strict=True)) < 1e-10, double
    cfg = CONFIGS["tiny"]
    for (m, b), args in runs.items():
        got = json.loads((tmp_path / args[0] / "steps.jsonl").open().readline())
        # per rank, as the harness counts it (it was the whole job's), with the layout
        assert (got["world"], got["cp"], got["dp"]) == (4, 4, 1)
        assert got["tokens_per_s"] * got["seconds"] == pytest.approx(64 / 4)
        vol = registry.get(m).bytes(
            world=4, batch=1, seq_local=16, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, elem=8, acc_elem=8, node_size=2, layout="zigzag",
            causal=True, **({"backward": b, "ranks_per_node": 2} if b else {}))
        want = [cfg.num_layers * (vol.sent("forward", link) + vol.sent("backward", link))
                for link in (None, "inter")]
        assert want[1] > 0
        assert [got["attention_sent_bytes"], got["attention_sent_inter_node_bytes"]] == want, (
            m, b, got, want)
        assert [got[f"attention_sent_{p}_bytes"] for p in ("forward", "backward")] == [
            cfg.num_layers * vol.sent(p) for p in ("forward", "backward")]
    # documents change the data too (positions restart): the mask is checked against the
    # engine's loss on the same batch with and without it
    masked, unmasked = spawn(_first_loss_with_documents, 1, args=([0, 16, 32, 48, 64],))[0]
    got = losses("documents", "--doc-len", "16")[0]
    assert abs(got - masked) < 1e-12 and abs(got - unmasked) > 1e-6, (got, masked, unmasked)
    for args, why in [(("--kv-heads", "3"), "not divisible by num_kv_heads=3"),
                      (("--window", "-1"), "--window -1"),
                      (("--global-every", "2"), "--global-every 2 needs --window"),
                      (("--method", "rign"), "unknown method 'rign'"),
                      # block-level (it needs the block's weights): by its level, not its name
                      (("--method", "tp"), "method 'tp' is block-level"),
                      (("--method", "baselines.tp:METHOD"),
                       "method 'baselines.tp:METHOD' is block-level"),
                      (("--ranks-per-node", "3"), "not divisible by ranks_per_node=3"),
                      (("--seq-len", "100"), "100 is not divisible by 8 (zigzag layout"),
                      (("--method", "ring", "--layout", "striped"),
                       "layout 'striped' is not supported"),
                      (("--checkpointing", "selective_half"), "needs the striped layout"),
                      (("--method", "ring", "--layout", "contiguous", "--backward", "ring"),
                       "method 'ring' cannot run this case: it has no option 'backward'")]:
        with pytest.raises(SystemExit, match=re.escape(why)):  # before any rank starts
            train.main(["--out", str(tmp_path / "bad"), "--steps", "1", *args])
        assert not (tmp_path / "bad").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="is a file, not a folder"):
        train.main(["--out", str(tmp_path / "file"), "--steps", "1"])


def test_a_model_of_ones_own_trains_from_its_config_json(tmp_path, monkeypatch, capfd):
    """scripts/train.py --model-config: a Hugging Face config.json of the tiny model's sizes
    but all four K/V heads trains with the losses of tiny with --kv-heads 4; its fields, not
    its path, are the run's identity (the file edited, a resume is refused; copied elsewhere,
    it resumes); --model beside it, and a file the engine cannot build, stop before anything
    is written."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")
    tiny = CONFIGS["tiny"]
    hf = {"model_type": "llama", "hidden_size": tiny.hidden_size,
          "num_hidden_layers": tiny.num_layers, "num_attention_heads": tiny.num_heads,
          "num_key_value_heads": tiny.num_heads, "intermediate_size": tiny.ffn_size,
          "vocab_size": tiny.vocab_size, "rope_theta": tiny.rope_theta,
          "rms_norm_eps": tiny.rms_eps, "tie_word_embeddings": False}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf))

    def losses(name, *args, steps=2):
        train.main(["--out", str(tmp_path / name), "--world", "1", "--steps", str(steps),
                    "--seq-len", "64", "--dtype", "float64", *args])
        return [loss for _, loss in _losses(tmp_path / name)]

    plain = losses("plain", "--kv-heads", str(tiny.num_heads))
    assert plain != losses("tiny")
    assert losses("own", "--model-config", str(config)) == plain
    assert "the --model-config model (" in capfd.readouterr().out
    saved = json.loads((tmp_path / "own" / "run.json").read_text())
    assert saved["model"] is None and saved["model_config"]["rope_theta"] == tiny.rope_theta
    moved = tmp_path / "elsewhere.json"
    shutil.copy(config, moved)
    # a run.json written before ModelConfig had some of its fields resumes with their defaults
    run = tmp_path / "own" / "run.json"
    run.write_text(json.dumps({**saved, "model_config": {
        k: v for k, v in saved["model_config"].items() if k not in ("gated_mlp", "window")}}))
    assert losses("own", "--model-config", str(moved), steps=3)[:2] == plain
    config.write_text(json.dumps({**hf, "rope_theta": 500000.0}))
    with pytest.raises(SystemExit, match=re.escape(  # the field that changed, alone
            "other arguments (model_config.rope_theta: 10000.0 then, 500000.0 now); use")):
        losses("own", "--model-config", str(config), steps=4)
    with pytest.raises(SystemExit, match=re.escape(
            "other arguments (model: 'tiny' then, --model-config's now); use")):
        losses("plain", "--kv-heads", str(tiny.num_heads), "--model-config", str(moved),
               steps=3)
    # under torchrun every process reads the file: one that differs between nodes is refused
    fields = saved["model_config"]
    assert train._other_model([(None, fields), (None, dict(fields))]) is None
    assert train._other_model([(None, fields), (None, {**fields, "rope_theta": 1.0})]) == (
        "rank 1 read another model from --model-config than rank 0 (the file differs between "
        "nodes): give every node the same file")
    with pytest.raises(SystemExit, match="--model tiny and --model-config give two models"):
        losses("both", "--model", "tiny", "--model-config", str(moved))
    assert not (tmp_path / "both").exists()
    config.write_text(json.dumps({**hf, "model_type": "gemma"}))
    for bad, why in ((config, "model_type='gemma' is not supported"),
                     (tmp_path / "none.json", "cannot read")):
        with pytest.raises(SystemExit) as e:
            losses("bad", "--model-config", str(bad))
        assert e.value.code == 2 and why in capfd.readouterr().err
        assert not (tmp_path / "bad").exists()


def test_a_mask_spanning_the_whole_sequence_is_no_mask(monkeypatch):
    """scripts/train.py: --doc-len >= --seq-len (one document) and --window >= --seq-len - 1
    are causal attention unmasked: the same run (a resume may name either) on the unmasked
    path; a shorter one is kept."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")

    def args(*extra):
        return vars(train._parser().parse_args(["--out", "x", "--seq-len", "64", *extra]))

    plain = train._identity(args(), 4)
    for extra in (("--doc-len", "64"), ("--doc-len", "100"), ("--window", "63"),
                  ("--window", "63", "--doc-len", "64"), ("--window", "63", "--global-every", "2")):
        assert train._identity(args(*extra), 4) == plain, extra
        assert train._model(args(*extra))[1:] == (None, None), extra
    assert train._model(args("--doc-len", "63"))[2] == [0, 63, 64]
    assert train._model(args("--window", "62"))[1] == (62, 0)
    assert train._identity(args("--window", "62"), 4) != plain
    assert train._model(args("--window", "62", "--global-every", "2"))[1] == ((62, 0), None)
    with pytest.raises(ValueError, match=re.escape(  # 2 layers: every one local, a typo
            "--global-every 3: every layer would be local (tiny has 2 layers); drop "
            "--global-every, or give 2")):
        train._model(args("--window", "62", "--global-every", "3"))


def test_without_layout_each_method_trains_on_its_own(monkeypatch):
    """scripts/train.py without --layout splits the sequence as the method does by default
    (contiguous for ring, which refuses zigzag), and naming that layout is the same run."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")

    def args(*extra):
        return vars(train._parser().parse_args(["--out", "x", "--seq-len", "64", *extra]))

    for method, own in (("ring", "contiguous"), ("burst", "zigzag"),
                        ("striped_ring", "striped"), ("ulysses", "contiguous")):
        train._preflight(args("--method", method), 4)  # no ValueError
        named = train._identity(args("--method", method, "--layout", own), 4)
        assert train._identity(args("--method", method), 4) == named
        assert named["layout"] == own
    with pytest.raises(ValueError, match="layout 'zigzag' is not supported"):
        train._preflight(args("--method", "ring", "--layout", "zigzag"), 4)
    # found by an audit: accepted here, then refused by every rank in the first forward
    with pytest.raises(ValueError, match="'ulysses' also saves tensors that are not rows"):
        train._preflight(args("--method", "ulysses", "--layout", "striped", "--checkpointing",
                              "selective_half"), 2)


def test_a_length_that_does_not_split_is_reported_once(monkeypatch):
    """scripts/train.py: a --seq-len the ranks cannot split is one clause (with the length to
    pad to), not that and the method's local length after it; the method's other problems
    are still named."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")

    def problems(*extra):
        args = vars(train._parser().parse_args(["--out", "x", "--seq-len", "127", *extra]))
        with pytest.raises(ValueError) as e:
            train._preflight(args, 2)
        return str(e.value)

    got = problems()
    assert got.startswith("sequence length 127 is not divisible by 4") and "pad to 128" in got
    assert "local sequence length" not in got and got.endswith("change the world size"), got
    got = problems("--method", "ring", "--layout", "zigzag")
    assert "local sequence length" not in got, got
    assert "method 'ring' cannot run this case: layout 'zigzag' is not supported" in got, got


def test_a_run_says_what_it_did_in_plain_words(tmp_path, monkeypatch, capfd):
    """scripts/train.py: one rank, one step, one K/V head in the singular; a run already at or
    past --steps says so and does nothing (no "resuming", no "done"); Ctrl-C is one line and
    exit 130, not a traceback."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")
    out = tmp_path / "run"

    def run(steps):
        train.main(["--out", str(out), "--world", "1", "--steps", steps, "--seq-len", "64",
                    "--dtype", "float64", "--kv-heads", "1"])
        return capfd.readouterr().out

    got = run("1")
    assert "1 K/V head)" in got and "1 rank (CP 1 x DP 1)" in got, got
    assert "done: 1 step;" in got, got
    assert "resuming at step 1" in run("2")
    log = (out / "steps.jsonl").read_text()
    got = run("1")
    assert got == f"{out} is already at step 2 >= --steps 1: nothing to do (a larger --steps " \
                  "trains on)\n", got
    assert (out / "steps.jsonl").read_text() == log

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "spawn", interrupted)
    monkeypatch.delenv("RANK", raising=False)
    try:  # (a KeyboardInterrupt escaping main would stop pytest itself: caught here)
        train.main(["--out", str(out), "--world", "1", "--steps", "3", "--seq-len", "64",
                    "--dtype", "float64", "--kv-heads", "1"])
        ended = None
    except BaseException as e:  # noqa: BLE001
        ended = e
    assert isinstance(ended, SystemExit) and ended.code == 130, repr(ended)
    err = capfd.readouterr().err
    assert err == ("interrupted; run the same command again to resume from the last saved "
                   "step\n"), err


def test_a_training_run_ended_by_sigterm_says_how_to_resume(tmp_path):
    """Found by a failure-injection audit: SIGTERM (a job's end, systemd) and SIGHUP (a dropped
    ssh session) ended train.py without a word (exit -15 / -1); they now end it as Ctrl-C
    does: its ranks stopped, one line, exit 130, and the same command resumes (SIGHUP takes
    the same handler: the torchrun test below)."""
    import signal

    sig = "SIGTERM"

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), "--out",
                             str(out), "--seq-len", "64", "--dtype", "float64", "--world", "2",
                             "--save-every", "1", "--steps", "10000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # a step done, and saved
            if line.startswith("step     2/"):
                break
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.endswith(f"interrupted ({sig}); run the same command again to resume from the "
                        "last saved step\n"), err[-3000:]
    assert "Traceback" not in err
    res = _train(out, "--world", "2", "--steps", "3", "--save-every", "1")
    assert res.returncode == 0 and "resuming at step" in res.stdout, res.stderr[-3000:]


def test_under_torchrun_each_rank_says_its_own_disk_error_and_signals_stay_torchruns(
        monkeypatch, capfd):
    """A review found train.py's new handling wrong under torchrun, where each rank is its own
    process: a disk error on rank 1 ended it without a word (only rank 0 printed), and the
    ranks turned SIGTERM, torchrun's way to stop them when one failed, into a Python
    exception that a rank blocked in a collective cannot raise."""
    import signal

    from burst.spawn import _terminate

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    train = importlib.import_module("train")
    seen = []

    def full(argv):
        seen.append({signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train, "_main", full)
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (under nohup it stays ignored)
    try:
        for env in ({"RANK": "1", "WORLD_SIZE": "2"}, {}):
            for k in ("RANK", "WORLD_SIZE"):
                monkeypatch.delenv(k, raising=False)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            with pytest.raises(SystemExit) as e:
                train.main([])
            assert e.value.code == 1
    finally:
        signal.signal(signal.SIGHUP, hup)
    assert _terminate not in seen[0] and seen[1] == {_terminate}  # the launcher's alone
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith("train.py (rank 1): [Errno 28] No space left on device;"), err
    assert err[1].startswith("train.py: [Errno 28] No space left on device;"), err


def test_a_folder_train_py_cannot_write_is_one_line(tmp_path):
    """Found by a failure-injection audit: an --out under a file (or on a full or read-only
    disk) failed with the launcher's traceback."""
    (tmp_path / "file").write_text("")
    res = _train(tmp_path / "file" / "run", "--world", "1", "--steps", "1")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.startswith("train.py: [Errno 20] Not a directory") and res.stderr.endswith(
        "a state saved before is kept: fix that and run the same command again to resume\n")


def test_a_training_run_killed_between_saves_resumes_with_the_same_losses(tmp_path):
    """scripts/train.py: a run that died after its last save (steps 4 and 5 logged, not saved)
    resumes from that save, on another number of ranks, runs those steps again and ends with
    the losses of the run that was never interrupted; other arguments are refused."""
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    res = _train(straight, "--world", "2", "--steps", "6")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step     6/6  loss" in res.stdout and "from the start" in res.stdout, res.stdout
    want = _losses(straight)
    assert [s for s, _ in want] == list(range(6)) and want[-1][1] < want[0][1], want
    assert _train(broken, "--world", "2", "--steps", "4").returncode == 0
    with (broken / "steps.jsonl").open("a") as f:  # what a run killed before step 6's save left
        f.write('{"step": 4, "loss": 99.0}\n{"step": 5, "loss": 99.0}\n{"step": 6, "lo')
    res = _train(broken, "--world", "1", "--steps", "6")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming at step 4" in res.stdout, res.stdout
    got = _losses(broken)
    assert [s for s, _ in got] == list(range(6)), got
    # one CP group of 1 instead of 2: the same tokens, summed in another order
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)
    res = _train(broken, "--world", "1", "--steps", "8", "--lr", "0.1")
    assert res.returncode != 0 and "lr: 0.003 then, 0.1 now" in res.stderr, res.stderr[-3000:]
    # a CP degree that does not divide the world is refused before run.json is written
    res = _train(tmp_path / "bad", "--world", "3", "--cp-degree", "2", "--steps", "1")
    assert res.returncode != 0 and "does not divide the world of 3" in res.stderr, res.stderr
    assert not (tmp_path / "bad").exists()
    # under torchrun (2 processes, gloo): the same losses, and a resume there
    launched = tmp_path / "torchrun"
    for steps in ("2", "3"):
        res = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", str(ROOT / "scripts" / "train.py"), "--out", str(launched), "--seq-len", "64",
             "--dtype", "float64", "--save-every", "2", "--steps", steps],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming at step 2" in res.stdout, res.stdout
    got = _losses(launched)
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want[:3], strict=True)) < 1e-12, got
    # a saved state without the arguments it was started with is not resumed with any
    (straight / "run.json").unlink()
    res = _train(straight, "--world", "1", "--steps", "8", "--lr", "0.1")
    assert res.returncode != 0 and "holds a saved state but no run.json" in res.stderr, (
        res.stderr[-3000:])
    # 2 DP groups of 1 sequence each: another global batch, so not the same run
    res = _train(broken, "--world", "2", "--cp-degree", "1", "--steps", "8")
    assert res.returncode != 0 and "global_batch: 1 then, 2 now" in res.stderr, res.stderr[-3000:]


def test_a_resume_may_change_cp_degree_batch_and_dp_wrapper(tmp_path):
    """scripts/train.py: the same global batch on another layout and DP wrapper is the same run,
    with the losses of one never interrupted (an engine audit found --cp-degree, --batch and
    --data-parallel bound to the first run's, against the docstring and the README)."""
    one, moved = tmp_path / "one", tmp_path / "moved"
    res = _train(one, "--world", "1", "--batch", "2", "--steps", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    res = _train(moved, "--world", "2", "--cp-degree", "1", "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    res = _train(moved, "--world", "2", "--cp-degree", "2", "--batch", "2", "--data-parallel",
                 "fsdp", "--steps", "3")
    assert res.returncode == 0 and "resuming at step 2" in res.stdout, res.stderr[-3000:]
    got, want = _losses(moved), _losses(one)
    assert [s for s, _ in got] == [0, 1, 2], got
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)


def test_a_sharded_state_resumes_a_run_on_another_layout(tmp_path):
    """scripts/train.py --sharded-state: every rank saves its own shards (FSDP over 2 ranks
    here), and the run resumes from them on another layout with the losses of one never
    interrupted, also under torchrun; a resume must keep the flag, and an unfinished state is
    refused before any rank starts."""
    one, sharded = tmp_path / "one", tmp_path / "sharded"
    res = _train(one, "--world", "1", "--batch", "2", "--steps", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    res = _train(sharded, "--world", "2", "--cp-degree", "1", "--data-parallel", "fsdp",
                 "--sharded-state", "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert os.readlink(sharded / "state") == "state.a" and not (sharded / "state.pt").exists()
    assert {"__0_0.distcp", "__1_0.distcp", "info.pt"} <= {
        p.name for p in (sharded / "state.a").iterdir()}
    res = _train(sharded, "--world", "2", "--cp-degree", "1", "--data-parallel", "fsdp",
                 "--steps", "3")
    assert res.returncode != 0 and "sharded_state: True then, False now" in res.stderr, (
        res.stderr[-3000:])
    res = _train(sharded, "--world", "2", "--cp-degree", "2", "--batch", "2", "--sharded-state",
                 "--steps", "3")
    assert res.returncode == 0 and "resuming at step 2" in res.stdout, res.stderr[-3000:]
    got, want = _losses(sharded), _losses(one)
    assert [s for s, _ in got] == [0, 1, 2], got
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)
    assert os.readlink(sharded / "state") == "state.b"  # the save at step 2 kept in state.a
    # --async-save: the save at step 1 written while step 2 runs, published by the last save
    # (which waits); resumed without the flag on another layout, with the same losses
    behind = tmp_path / "async"
    res = _train(behind, "--world", "2", "--cp-degree", "1", "--data-parallel", "fsdp",
                 "--sharded-state", "--async-save", "--save-every", "1", "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert os.readlink(behind / "state") == "state.b"  # step 1 in state.a, step 2 in state.b
    res = _train(behind, "--world", "2", "--cp-degree", "2", "--batch", "2", "--sharded-state",
                 "--steps", "3")
    assert res.returncode == 0 and "resuming at step 2" in res.stdout, res.stderr[-3000:]
    got = _losses(behind)
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)
    # under torchrun (2 processes, gloo, FSDP): the same losses, and a resume there
    launched = tmp_path / "torchrun"
    for steps in ("2", "3"):
        res = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", str(ROOT / "scripts" / "train.py"), "--out", str(launched), "--seq-len", "64",
             "--dtype", "float64", "--save-every", "2", "--steps", steps, "--cp-degree", "1",
             "--data-parallel", "fsdp", "--sharded-state"],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming at step 2" in res.stdout, res.stdout
    got = _losses(launched)
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-10, (got, want)
    # a run copied with its link followed (cp -rL, scp -r): its state a folder, which resumed
    # and then failed at the first save, every retry (a training audit); refused at the start,
    # with the commands that make it a link again
    copied = tmp_path / "copied"
    shutil.copytree(sharded, copied, symlinks=False)
    assert (copied / "state").is_dir() and not (copied / "state").is_symlink()
    res = _train(copied, "--world", "2", "--sharded-state", "--batch", "2", "--steps", "4")
    assert res.returncode != 0 and "is a folder, not the link a sharded save keeps" in \
        res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]
    shutil.rmtree(copied / "state.a")
    (copied / "state").rename(copied / "state.a")
    (copied / "state").symlink_to("state.a")
    res = _train(copied, "--world", "2", "--sharded-state", "--batch", "2", "--steps", "4")
    assert res.returncode == 0 and "resuming at step 3" in res.stdout, res.stdout[-3000:]
    (sharded / "state.b" / "info.pt").unlink()  # a save that did not finish
    res = _train(sharded, "--world", "2", "--sharded-state", "--batch", "2", "--steps", "4")
    assert res.returncode != 0 and "is not a state Trainer.save(..., sharded=True) finished" in (
        res.stderr), res.stderr[-3000:]


def test_train_help_shows_each_default(monkeypatch):
    """train.py --help showed no defaults (tiny model, 4 ranks, 1024 tokens, selective), which
    the README quotes (a new user's walk); an option whose help says its default is left as
    it is."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    text = " ".join(importlib.import_module("train")._parser().format_help().split())
    for shown in ("engine config (default: tiny, unless --model-config", "(default: 4)",
                  "(default: 1024)", "recomputation mode (default: selective)",
                  "initial weights (default: 0)", "K/V heads (GQA; default: the model config's)"):
        assert shown in text, shown
    assert "(default: None)" not in text and "default: False" not in text


def test_a_second_run_of_the_same_folder_is_refused_while_one_writes_it(tmp_path):
    """Two starts of one --out (the command run again while a first, or ranks its killed
    launcher left, still trained) resumed the same state and wrote over each other's saves
    and logs: steps logged twice, and one run's rename of state.pt.tmp failed (a resume
    audit). The run holds the folder's lock (results.store.RunLock) while it writes it."""
    from results.store import RunLock

    out = tmp_path / "run"
    assert _train(out, "--world", "1", "--steps", "2").returncode == 0
    before = (out / "steps.jsonl").read_text()
    with RunLock(out):  # another run holds it
        res = _train(out, "--world", "1", "--steps", "4")
    assert res.returncode != 0 and "is being written by another training run" in res.stderr, (
        res.stderr[-3000:])
    assert (out / "steps.jsonl").read_text() == before
    res = _train(out, "--world", "1", "--steps", "4")  # once it has ended
    assert res.returncode == 0 and "resuming at step 2" in res.stdout, res.stderr[-3000:]
    assert [s for s, _ in _losses(out)] == [0, 1, 2, 3]


def test_a_resume_refuses_a_garbled_log_and_says_which_steps_its_log_lacks(tmp_path,
                                                                        flip_state_bit):
    """A whole line of steps.jsonl that is not a step's record failed on the ranks, with a
    traceback per rank and gloo's closed connections; a log that lost lines was resumed without
    a word; and --doc-len 1 (no token has a next one in its document) passed the checks made
    before the ranks start, then failed on them (a resume audit)."""
    res = _train(tmp_path / "docs" / "a" / "b", "--world", "1", "--steps", "1", "--doc-len", "1")
    assert res.returncode != 0 and "a document of one token" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "docs").exists()
    out = tmp_path / "run"
    assert _train(out, "--world", "1", "--steps", "2").returncode == 0
    log = out / "steps.jsonl"
    good = log.read_text()
    for bad in ('"stop": 1', '"step": "1"'):  # no step, a step the resume cannot compare
        log.write_text(good.replace('"step": 1', bad, 1))
        res = _train(out, "--world", "1", "--steps", "3")
        assert res.returncode != 0 and "line 2 is not a step's record" in res.stderr, (
            res.stderr)
        assert "Traceback" not in res.stderr
    state = out / "state.pt"
    whole = state.read_bytes()
    state.write_bytes(whole[:len(whole) // 2])  # a cut copy
    res = _train(out, "--world", "1", "--steps", "3")
    assert res.returncode != 0 and "state.pt is not a whole saved state" in res.stderr, (
        res.stderr)
    assert "Traceback" not in res.stderr
    # a damaged zip index (a record name that is no UTF-8): refused in one line, as a cut
    # copy is (zipfile raised a UnicodeDecodeError through the check: a training audit)
    index = whole.rindex(b"PK\x01\x02")  # the last record's entry in the central directory
    state.write_bytes(whole[:index + 46] + b"\xff" + whole[index + 47:])
    res = _train(out, "--world", "1", "--steps", "3")
    assert res.returncode != 0 and "state.pt is not a whole saved state" in res.stderr, (
        res.stderr)
    assert "Traceback" not in res.stderr
    # a run.json that is JSON but not the run's arguments, or one with a value of a wrong type
    state.write_bytes(whole)
    run = out / "run.json"
    args = run.read_text()
    for text, why in (("null\n", "cannot be read (it holds a NoneType"),
                      (args.replace('"seq_len": 64', '"seq_len": "64"'),
                       "names a run this version cannot rebuild (TypeError")):
        run.write_text(text)
        res = _train(out, "--world", "1", "--steps", "3")
        assert res.returncode != 0 and why in res.stderr and "Traceback" not in res.stderr, (
            res.stderr[-3000:])
    run.write_text(args)
    log.write_text(good)
    flip_state_bit(state)  # whole, but a bit changed since the save: refused on rank 0
    res = _train(out, "--world", "1", "--steps", "3")
    assert res.returncode == 1 and "was changed after Trainer.save wrote it" in res.stderr, (
        res.stderr)
    assert "(a state saved before stays in --out as it was)" in res.stderr
    assert res.stderr.count("Traceback") == 1, res.stderr  # the rank's, not the launcher's
    state.write_bytes(whole)
    log.write_text(good.splitlines(keepends=True)[1])  # step 0's line lost
    res = _train(out, "--world", "1", "--steps", "3")
    assert res.returncode == 0 and "resuming at step 2" in res.stdout, res.stderr[-3000:]
    assert "has no line for 1 step of the 2 the saved state has done (first: step 0)" in \
        res.stderr, res.stderr[-3000:]
    assert [s for s, _ in _losses(out)] == [1, 2]
