"""DynamicExecutable: a symbolic program compiled for bindings of its symbols; each run takes the one its feeds fit.
StagedExecutable: a staged program compiled: its head, the host ops, then its tail bound to the sizes they gave."""
from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from cinn.core.ir import Program
from cinn.core.symbolic import Binding, ShapeBindingError, StagedProgram, SymbolicProgram
from cinn.runtime.executable import Executable, Profile, feed_as_array
from cinn.runtime.machine import Peaks

# executables built at run time before a warning says so: each holds its kernels and workspace for good (a serving
# loop that feeds a by-value input a new value per request would build and keep one per request)
MANY_ON_DEMAND = 32
# bindings the symbolic kernels serve at once: each holds a workspace of its sizes (BERT-base at batch 8, seq 384:
# ~0.3 GB); the least recently run is dropped past this, and planned again (no build) when it comes back
MAX_SERVED = 8


class DynamicExecutable:
    """Executables of one symbolic program, one per binding of its symbols (``batch=4, seq=128``).

    The bindings given at compile time are built then, each specialized to its sizes. A run whose shapes give another
    binding runs on the symbolic kernels when there are some (`symbolic`: built once at compile time for every size;
    counted in `served_symbolic`; not a binding with a symbol of 0), else builds the binding first when `on_demand`
    (counted in `built_on_demand`), else raises naming the bindings there are. Safe to run from several threads: a
    binding is built once. With `run_time_sizes` (a staged program's tail, whose sizes come from the data, so that a
    server may meet new ones at every request), at most MANY_ON_DEMAND of those built are kept, the oldest dropped.
    """

    def __init__(self, program: SymbolicProgram, build: Callable[[Program | StagedProgram], Executable | StagedExecutable],
                 bindings: Iterable[Binding], on_demand: bool = True,
                 symbolic: Callable[[Binding], Executable] | None = None, symbolic_reason: str = "",
                 run_time_sizes: bool = False):
        self.program = program
        self._run_time_sizes = run_time_sizes
        self._build = build
        self._on_demand = on_demand
        self._symbolic = symbolic
        # why the program has no symbolic kernels ("" when it has them, or when they were not asked for)
        self.symbolic_reason = symbolic_reason
        self._lock = threading.Lock()
        self._executables: dict[Binding, Executable | StagedExecutable] = {}
        # bindings served by the symbolic kernels, least recently used first: each holds only its buffers
        self._served: collections.OrderedDict[Binding, Executable] = collections.OrderedDict()
        self._by_shapes: dict[tuple, Executable | StagedExecutable] = {}  # the feeds' shapes seen -> their executable: runs skip binding
        self._names = [i.name for i in program.inputs]
        # what each input takes, for the messages of feeds that are not arrays of numbers
        self._expected = {i.name: f"{i.dtype} of shape ({', '.join(map(str, i.dims))})" for i in program.inputs}
        self._by_value = [i.name for i in program.inputs if i.by_value]  # constants of each executable, not its inputs
        for b in bindings:
            self._executables[b] = build(program.specialize(b))
        self.built_on_demand = 0
        self.served_symbolic = 0  # bindings the symbolic kernels took (nothing built for them)

    @property
    def symbolic_kernels(self) -> bool:
        """Whether bindings not built ahead run on kernels built once for every size (see cinn.compiler.symbolic_kernels)."""
        return self._symbolic is not None

    @property
    def bindings(self) -> tuple[Binding, ...]:
        """The bindings built so far, in build order (without those the symbolic kernels serve)."""
        return tuple(self._executables)

    def executable(self, binding: Binding) -> Executable | StagedExecutable:
        """The executable of a binding: its own build (made now if it is new, there are no symbolic kernels and
        building on demand is on), else the symbolic kernels with buffers for its sizes."""
        exe = self._executables.get(binding)
        if exe is not None:
            return exe
        with self._lock:
            if binding in self._executables:
                return self._executables[binding]
            # kernels of every size would run a symbol of 0 as loops of no iteration (a max over no element is not
            # -inf there): that binding's own compile folds its zero-size tensors instead
            if self._symbolic is not None and not binding.has_zero:
                return self._served_by_symbolic(binding)
            if not self._on_demand:
                built = "; ".join(map(str, self._executables)) or "none"
                raise ShapeBindingError(f"{self.program.name}: no executable for {binding} (built: {built}); "
                                        "compile with shape hints that include it, or on demand")
            exe = self._executables[binding] = self._build(self.program.specialize(binding))
            self.built_on_demand += 1
            if self._run_time_sizes and len(self._executables) > MANY_ON_DEMAND:
                del self._executables[next(iter(self._executables))]
                self._by_shapes.clear()  # it may hold the one dropped
            if self.built_on_demand == MANY_ON_DEMAND:
                warnings.warn(self._many_built(), stacklevel=3)
            return exe

    def _many_built(self) -> str:
        """The warning once MANY_ON_DEMAND bindings have been built at run time."""
        if self._run_time_sizes:
            return (f"cinn: {self.program.name} has built {MANY_ON_DEMAND} executables for sizes known only at run "
                    f"time, as each new set of sizes is (no symbolic kernels: {self.symbolic_reason}); the oldest "
                    "are dropped from now on")
        return (f"cinn: {self.program.name} has built {MANY_ON_DEMAND} executables at run time, each kept for good; "
                f"hint the sizes at compile time, or fix the inputs read by value ({', '.join(self._by_value) or 'none'})")

    def _served_by_symbolic(self, binding: Binding) -> Executable:
        """The symbolic kernels' executable of a binding (the caller holds the lock); the least recently used of
        more than MAX_SERVED is dropped, so serving many sizes keeps a bounded number of workspaces."""
        assert self._symbolic is not None
        exe = self._served.pop(binding, None)
        if exe is None:
            exe = self._symbolic(binding)
            self.served_symbolic += 1
            if len(self._served) >= MAX_SERVED:
                self._served.popitem(last=False)
        self._served[binding] = exe
        return exe

    def bind(self, feeds: Mapping[str, np.ndarray]) -> Binding:
        """The binding of the symbols that the feeds' shapes give (a clear error for shapes that do not fit)."""
        return self.program.bind({i.name: np.shape(feeds[i.name]) for i in self.program.inputs if i.name in feeds},
                                 {n: feeds[n] for n in self._by_value if n in feeds})

    def run(self, feeds: Mapping[str, np.ndarray], out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Execute with named input arrays of any shapes the program takes (see Executable.run)."""
        feeds = self._arrays(feeds)
        return self._executable_of(feeds).run(self._runtime_feeds(feeds), out)

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 20, peaks: Peaks | None = None) -> Profile:
        """Profile the executable of the feeds' binding (see Executable.profile)."""
        feeds = self._arrays(feeds)
        return self._executable_of(feeds).profile(self._runtime_feeds(feeds), repeat, peaks)

    def _arrays(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """The feeds of the program's inputs as arrays (arrays as they are), before their shapes are read; anything
        else is left to the executable's checks (which name a missing input or feeds that are not a mapping)."""
        if not isinstance(feeds, Mapping):
            return feeds
        return {k: feed_as_array(k, v, self._expected[k]) if k in self._expected else v for k, v in feeds.items()}

    def _runtime_feeds(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return {k: v for k, v in feeds.items() if k not in self._by_value} if self._by_value else feeds

    def _executable_of(self, feeds: Mapping[str, np.ndarray]) -> Executable | StagedExecutable:
        try:
            key = tuple(np.shape(feeds[n]) for n in self._names)
            key += tuple(tuple(np.asarray(feeds[n]).reshape(-1).tolist()) for n in self._by_value)
        except KeyError:
            key = None  # bind() names the missing input
        exe = self._by_shapes.get(key) if key is not None else None
        if exe is None:
            binding = self.bind(feeds)
            exe = self.executable(binding)
            if key is not None and binding in self._executables:  # the symbolic kernels' executables may be dropped
                self._by_shapes[key] = exe
        return exe


class StagedExecutable:
    """A StagedProgram compiled: each run runs the head's kernels, then the host ops on the host over its outputs, then
    the tail (a DynamicExecutable) at the sizes they gave: on its symbolic kernels where it has some, else on the
    executable built for those sizes (at their first run; see DynamicExecutable). Safe to run from several threads."""

    def __init__(self, program: StagedProgram, head: Executable, tail: DynamicExecutable):
        self.program = program
        self.head = head
        self.tail = tail

    def run(self, feeds: Mapping[str, np.ndarray], out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Execute with named input arrays (see Executable.run); `out` takes the tail's outputs, the program's."""
        values = dict(zip(self.program.links, self.head.run(feeds), strict=True))
        for op in self.program.host_ops:
            values.update(zip(op.outputs, op.run([values[n] if n else None for n in op.inputs]), strict=True))
        return self.tail.run({i.name: values[i.name] for i in self.tail.program.inputs}, out)

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 20, peaks: Peaks | None = None) -> Profile:
        """Not for a whole staged program (its stages' kernels run at sizes each run chooses): profile the head."""
        raise NotImplementedError(f"{self.program.name} runs in stages: profile its head (exe.head.profile(feeds)) or "
                                  "a tail binding's executable (exe.tail.executable(binding))")
