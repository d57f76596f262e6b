"""The procedural world: a seeded 3-D scene, a raycasting renderer and the one motion model.

``motion`` is the project's single source of truth for camera poses; ``scene`` builds a world
from a seed; ``render`` draws it from a pose (the ground truth of the ``loopworld`` preset).
"""
