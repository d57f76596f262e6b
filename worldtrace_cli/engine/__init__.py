"""The engine: the chunk loop that ``generate`` and live sessions share (:mod:`.loop`)."""
