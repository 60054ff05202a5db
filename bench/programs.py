"""The benchmark programs ./kit bench runs, read from bench/programs.txt.

programs.txt is the one list of them (./kit and bench/meson.build read it
too); this module is how the Python scripts read it:

    for program in programs():
        program.name          # "bench_allreduce"
        program.world_sizes   # [2, 4]; [] for a program that spawns no ranks
        program.results_file(2)  # "bench_allreduce.w2.json"
"""

import os
from typing import List, NamedTuple, Optional

LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs.txt")


class Program(NamedTuple):
    name: str
    world_sizes: List[int]  # [] for a program that spawns no ranks ("-" in the list)

    def results_file(self, world_size: Optional[int] = None) -> str:
        """The file ./kit bench writes its results to, at `world_size` ranks
        (None for a program that spawns no ranks)."""
        return self.name + (f".w{world_size}" if world_size else "") + ".json"


def programs(path: str = LIST) -> List[Program]:
    """The programs of the list, in its order. A malformed line raises
    ValueError naming it: a typo in the list must not drop a program."""
    found = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            sizes = words[1:]
            if sizes == ["-"]:
                found.append(Program(words[0], []))
            elif sizes and all(w.isdigit() and int(w) > 0 for w in sizes):
                found.append(Program(words[0], [int(w) for w in sizes]))
            else:
                raise ValueError(f"{path}:{number}: '{line.strip()}': want a program's name, "
                                 "then its world sizes (whole numbers) or '-'")
    return found
