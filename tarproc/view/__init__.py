"""Seeing inside a dataset: the self-contained HTML report (``tarshow --report``) and the local web
viewer (``tarshow --serve``). Not part of the streaming core: nothing below tarproc/view imports it."""
