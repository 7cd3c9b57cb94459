"""Conceptual pictures of the course, one idea per module (issue 17).

Each module draws one idea (what a collective does to the data, which rank holds which
shard, ...) with matplotlib from the same library objects the notebooks run, so a picture is
the same in every notebook that shows it. Each returns the figure and, where a test needs it,
the data it drew (which rank holds which block), and is tested for what it draws. Import a
picture from its module: ``from lecture_lib.figures.pictures.collectives import draw``.
"""
