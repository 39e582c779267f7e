"""Reference answers to the lessons' exercises, one module per lesson (``lessonNN.py``)."""
