"""Self-Forcing / LongLive v1.0 (Wan2.1-T2V-1.3B, chunk 3): the DiT is
:class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` with ``model_type: t2v`` (no image channels, no
camera branch; selfforcing-architecture.md §1-§4); this folder holds what differs: the sampler."""
