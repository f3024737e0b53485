"""Dead code elimination: drop nodes and constants that no program output needs."""
from __future__ import annotations

from cinn.core.ir import Program


def dce(program: Program) -> Program:
    """Keep only nodes whose outputs are (transitively) needed by the program outputs, and the constants they read.

    Program inputs are the calling interface and always stay, used or not.
    """
    live = {v.name for v in program.outputs}
    kept = []
    for node in reversed(program.nodes):
        if any(v.name in live for v in node.outputs):
            kept.append(node)
            live.update(v.name for v in node.inputs)
    constants = {k: a for k, a in program.constants.items() if k in live}
    if len(kept) == len(program.nodes) and len(constants) == len(program.constants):
        return program
    return program.replace(nodes=tuple(reversed(kept)), constants=constants)
