"""Known-wrong answers to each lesson's exercises, one module per lesson: ``WRONG`` lists
(exercise, answer) pairs that its check must reject."""
