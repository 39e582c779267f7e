"""The tests behind the lessons' exercises: ``checks/lessonNN.py`` holds ``test_<name>``."""
