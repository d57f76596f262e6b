"""The jobs the CLI runs: generate (pipeline + run folder + sinks), compare, loopbench, bench."""
