"""``worldtrace play``: live sessions in a web page (:mod:`.server`; the page is ``static/``)."""
