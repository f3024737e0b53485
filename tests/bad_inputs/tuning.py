"""Tuning logs given to compile (and cinn-run --log), and cost-model files given to cinn-tune --cost-model.

A tuning log's bad record is skipped (with a warning naming the log where it could carry code) and the tiny model
runs with the right result; a bad cost-model file is refused, naming the file.
"""
from __future__ import annotations

import io
import json
import pathlib
import zipfile
from collections.abc import Callable

import numpy as np

from tests.bad_inputs import payloads, tiny
from tests.bad_inputs.core import MARKER, Action, Api, Case, Category, Cli, Entry, Expect, Want

LOG, COST_MODEL = "log.jsonl", "cm.npz"
NAMES_LOG = Expect(Want.RESULT, warns=LOG)
RUNS = Expect(Want.RESULT)
REFUSED = Expect(Want.ERROR, names=COST_MODEL)
# cinn-tune flags that keep a run that gets past its checks short
SHORT_TUNE = ("--trials", "1", "--batch", "1", "--verify", "0", "--no-model-check", "--repeat", "1", "--no-cache-flush")


def _log(*lines: Callable[[pathlib.Path], str | bytes]) -> Callable[[pathlib.Path], None]:
    """A log of these lines, each made from the case's folder."""
    def make(d: pathlib.Path) -> None:
        made = [line(d) for line in lines]
        (d / LOG).write_bytes(b"".join((m if isinstance(m, bytes) else m.encode()) + b"\n" for m in made))

    return make


def _annotated(key: str, value: Callable[[pathlib.Path], str]) -> Callable[[pathlib.Path], str]:
    return lambda d: tiny.record(d / tiny.NAME, (key, value(d)))


def _ll_file(d: pathlib.Path) -> str:
    path = d / "payload.ll"
    path.write_text(payloads.llvm_constructor(d / MARKER))
    return str(path)


def _edited(edit: Callable[[dict], None]) -> Callable[[pathlib.Path], str]:
    """The tiny kernel's record (its default trace) with a field changed."""
    def line(d: pathlib.Path) -> str:
        record = json.loads(tiny.record(d / tiny.NAME))
        edit(record)
        return json.dumps(record)

    return line


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda r: r.__setitem__(key, value)


def _trace(insts: list, decision: object = None) -> Callable[[dict], None]:
    """The record's trace (its blocks and loops: l3 is the outer loop of the relu) followed by `insts`; `decision`:
    that of the first of them."""
    def edit(r: dict) -> None:
        mine = json.loads(r["trace"])[0]
        r["trace"] = json.dumps([mine + insts, [] if decision is None else [[len(mine), decision]]])

    return edit


_TILE = [["SamplePerfectTile", ["l3"], [2, 16], ["v9", "v10"]], ["Split", ["l3", "v9", "v10"], [True, False], ["l11", "l12"]]]
_HUGE_SPLIT = [["Split", ["l3", 1099511627776, None], [True, False], ["l11", "l12"]]]


def _tuning_cases() -> list[Case]:
    llvm = _annotated("pragma_import_llvm", lambda d: payloads.llvm_constructor(d / MARKER))
    specs: list[tuple[str, Callable[[pathlib.Path], None], Expect]] = [
        ("pragma_import_llvm with a constructor payload", _log(llvm), NAMES_LOG),
        ("pragma_import_llvm of a payload .ll file", _log(_annotated("pragma_import_llvm", _ll_file)), NAMES_LOG),
        ("pragma_import_c with a constructor payload",
         _log(_annotated("pragma_import_c", lambda d: payloads.c_constructor(d / MARKER))), NAMES_LOG),
        ("an annotation key outside cinn's space", _log(_annotated("pragma_evil", lambda _: "1")), NAMES_LOG),
        ("an unknown instruction kind", _log(_edited(_trace([["EvilInstruction", ["l3"], [], []]]))), NAMES_LOG),
        ("a Split by 2**40", _log(_edited(_trace(_HUGE_SPLIT))), RUNS),
        ("a tile decision of [2**40, 2**40]", _log(_edited(_trace(_TILE, [2**40, 2**40]))), RUNS),
        ("a tile decision of [0, 0]", _log(_edited(_trace(_TILE, [0, 0]))), RUNS),
        ("a tile decision of [-1, -2]", _log(_edited(_trace(_TILE, [-1, -2]))), RUNS),
        ("a line that is not JSON", _log(lambda _: "{"), NAMES_LOG),
        ("a line holding a JSON list", _log(lambda _: "[1, 2]"), NAMES_LOG),
        ("a line holding null", _log(lambda _: "null"), NAMES_LOG),
        ("a record without a trace", _log(_edited(lambda r: r.pop("trace"))), NAMES_LOG),
        ("costs that are strings", _log(_edited(_set("costs", ["fast"]))), NAMES_LOG),
        ("costs that are negative or NaN", _log(_edited(_set("costs", [-1.0, float("nan")]))), RUNS),
        ("an unknown failure kind", _log(_edited(_set("failure", "evil"))), NAMES_LOG),
        ("a trace that is not JSON", _log(_edited(_set("trace", "not json"))), RUNS),
        ("a trace of the wrong shape", _log(_edited(_set("trace", '{"a": 1}'))), RUNS),
        ("a trace of another kernel's blocks", _log(_edited(_trace([["GetSBlock", [], ["nothing", "main"], ["b9"]]]))), RUNS),
        ("a wrong workload key", _log(_edited(_set("workload", "0" * 16))), RUNS),
        ("a workload key of 1 MB", _log(_edited(_set("workload", "f" * 2**20))), RUNS),
        ("a wrong target", _log(_edited(_set("target", "llvm -mcpu=evil"))), RUNS),
        ("invalid UTF-8", _log(lambda _: b"\xff\xfe\x80 not text"), RUNS),
        ("NUL bytes", _log(lambda _: b"\0" * 4096), RUNS),
    ]
    cases = [Case(Category.TUNING_LOG, name, Api(Action.COMPILE_TINY, LOG), make, expect) for name, make, expect in specs]
    cases += [
        Case(Category.TUNING_LOG, "cinn-run --log with a pragma_import_llvm payload", Cli(Entry.RUN, (tiny.NAME, "--log", LOG)),
             _log(llvm), NAMES_LOG, alone=True),
        Case(Category.TUNING_LOG, "a log that is a folder", Api(Action.COMPILE_TINY, LOG), lambda d: (d / LOG).mkdir(),
             Expect(Want.ERROR, names=LOG)),
        Case(Category.TUNING_LOG, "a missing log", Api(Action.COMPILE_TINY, LOG), expect=Expect(Want.ERROR, names=LOG)),
    ]
    return cases


# -- cost-model files ----------------------------------------------------------------------------------------------
def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A .npy file's header declaring `shape` (followed by a few bytes of data only)."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64


def _npz(members: dict[str, bytes | np.ndarray]) -> Callable[[pathlib.Path], None]:
    """An .npz of these members: arrays (saved as .npy) or raw .npy bytes."""
    def make(d: pathlib.Path) -> None:
        with zipfile.ZipFile(d / COST_MODEL, "w") as z:
            for name, member in members.items():
                z.writestr(f"{name}.npy", _npy(member) if isinstance(member, np.ndarray) else member)

    return make


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _meta(**config: object) -> np.ndarray:
    rng = np.random.default_rng(0).bit_generator.state
    return np.array(json.dumps({"seed": 0, "config": config, "rng": rng, "fitted_samples": 0}))


def _valid(d: pathlib.Path) -> bytes:
    from autotune.cost_model import CostModel

    CostModel(seed=0).save(d / COST_MODEL)
    return (d / COST_MODEL).read_bytes()


def _write(content: Callable[[pathlib.Path], bytes]) -> Callable[[pathlib.Path], None]:
    return lambda d: (d / COST_MODEL).write_bytes(content(d))


def _zip_of_text(d: pathlib.Path) -> None:
    with zipfile.ZipFile(d / COST_MODEL, "w") as z:
        z.writestr("a.txt", "hello")


def _cost_model_cases() -> list[Case]:
    empty_booster = np.zeros(0, np.uint8)
    workloads = np.array(["w"])
    specs: list[tuple[str, Callable[[pathlib.Path], None]]] = [
        ("an empty file", _write(lambda _: b"")),
        ("random bytes", _write(lambda _: np.random.default_rng(1).bytes(4096))),
        ("a saved model cut in half", _write(lambda d: _valid(d)[: len(_valid(d)) // 2])),
        ("a zip of a text file", _zip_of_text),
        ("an npz without meta", _npz({"rows_0": np.ones(3)})),
        ("meta that is not JSON", _npz({"meta": np.array("{nope"), "workloads": workloads, "booster": empty_booster})),
        ("meta that is a JSON list", _npz({"meta": np.array("[1]"), "workloads": workloads, "booster": empty_booster})),
        ("an unknown config key", _npz({"meta": _meta(evil=1), "workloads": np.array([], str), "booster": empty_booster})),
        ("a negative warmup_samples", _npz({"meta": _meta(warmup_samples=-5), "workloads": np.array([], str),
                                            "booster": empty_booster})),
        ("eta of NaN", _npz({"meta": _meta(eta=float("nan")), "workloads": np.array([], str), "booster": empty_booster})),
        ("max_depth of 10**9", _npz({"meta": _meta(max_depth=10**9), "workloads": np.array([], str), "booster": empty_booster})),
        ("rows declared (1, 2**40)", _npz({"meta": _meta(), "workloads": workloads, "booster": empty_booster,
                                           "rows_0": _npy_header((1, 2**40)), "costs_0": np.ones(1)})),
        ("a booster declared 2**50 bytes", _npz({"meta": _meta(), "workloads": np.array([], str),
                                                 "booster": _npy_header((2**50,), "|u1")})),
        ("a booster of garbage", _npz({"meta": _meta(), "workloads": np.array([], str),
                                       "booster": np.frombuffer(b"garbage!" * 8, np.uint8)})),
        ("rows of strings", _npz({"meta": _meta(), "workloads": workloads, "booster": empty_booster,
                                  "rows_0": np.array([["a", "b"]]), "costs_0": np.array(["c"])})),
        ("a pickled object array", lambda d: payloads.object_npz(d / COST_MODEL, d / MARKER)),
        ("a .npy, not an .npz", _write(lambda _: _npy_header((3,), "<f8"))),
        ("a folder", lambda d: (d / COST_MODEL).mkdir()),
    ]
    cases = [Case(Category.COST_MODEL, name, Api(Action.COST_MODEL, COST_MODEL), make, REFUSED) for name, make in specs]
    cli = Cli(Entry.TUNE, (tiny.NAME, "--log", LOG, "--cost-model", COST_MODEL, *SHORT_TUNE))
    # alone: the file that declares 2**40 rows, the one that carries a payload
    cases += [Case(Category.COST_MODEL, f"cinn-tune --cost-model: {name}", cli, make, REFUSED, alone)
              for (name, make), alone in ((specs[0], False), (specs[11], True), (specs[15], True))]
    return cases


def cases() -> list[Case]:
    return _tuning_cases() + _cost_model_cases()
