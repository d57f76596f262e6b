"""LoopBench: loop trajectories that leave a place and come back, to measure episodic recall.

:mod:`worldtrace_cli.loopbench.configs` holds the paper's configurations as data (``CONFIGS``,
``loop_trajectory``) and writes ``trajectories/loopbench/`` (``python -m
worldtrace_cli.loopbench.configs``). Nothing is imported here, so that command runs cleanly.
"""
