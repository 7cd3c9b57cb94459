"""Sphinx configuration of the course's web book (``make book``; tools/book.py assembles the
sources next to this file and runs Sphinx on them). The notebooks arrive executed (nbval's run,
kept by conftest.py): MyST-NB renders them and runs nothing. Everything a page needs is served
from the book itself: MathJax from sphinx-mathjax-offline, the theme's fonts and scripts from
sphinx-book-theme, the search index from Sphinx; no page loads anything from another host."""
project = "Parallelism Basics"
author = "the Parallelism Basics maintainers"
copyright = "the Parallelism Basics maintainers"
extensions = ["myst_nb", "sphinx-mathjax-offline"]
nb_execution_mode = "off"                 # executed once, by the tests
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
html_theme = "sphinx_book_theme"
html_title = "Parallelism Basics"
html_theme_options = {
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
}
html_static_path = []
html_last_updated_fmt = None
exclude_patterns = ["_build", "conf.py"]
