"""Sphinx's configuration for the site: myst-nb reads the notebooks `docs/stage.py` staged from nbdev's `_proc/`
(outputs as nbdev left them: nothing is executed), sphinx-book-theme lays them out with the sidebar of `sidebar.yml`.
Everything a page loads is served from the site itself (MathJax included): it works offline.

Build: `bash .ci/docs` (or `sphinx-build -W --keep-going -c docs _sphinx/src _docs` after staging)."""
import shutil, sys
from pathlib import Path
from nbdev.config import get_config

cfg = get_config(str(Path(__file__).resolve().parents[1]))
project, author = cfg.lib_name, cfg.author
html_title = cfg.lib_name
html_baseurl = cfg.doc_host.rstrip('/') + '/' + cfg.doc_baseurl.strip('/') + '/'

extensions = ['myst_nb', 'sphinx.ext.mathjax', 'sphinx.ext.githubpages']  # githubpages: .nojekyll
exclude_patterns = ['**/.ipynb_checkpoints']
root_doc = 'index'

# myst-nb: nbdev's outputs as they are
nb_execution_mode = 'off'
nb_output_stderr = 'show'
nb_render_markdown_format = 'myst'  # show_doc's output: headings, signatures, doclinks, the source link's class
myst_enable_extensions = ['dollarmath', 'attrs_inline', 'colon_fence']
myst_heading_anchors = 6  # headings answer to the anchors Quarto gives them, which nbdev's doclinks use

myst_heading_slug_func = 'stage.pandoc_slug'
sys.path.insert(0, str(Path(__file__).parent))  # for stage.py


# the theme, with the sidebar staged on the root page
html_theme = 'sphinx_book_theme'
html_theme_options = {'repository_url': cfg.git_url, 'use_repository_button': True, 'use_download_button': False,
                      'show_toc_level': 2, 'navigation_with_keys': False}
html_context = {'default_mode': 'auto'}  # else the theme logs an error for a first visit's empty mode
html_favicon = 'static/favicon.svg'  # else the browser's request for /favicon.ico fails
html_static_path = ['static']
html_css_files = ['fastrepro.css']
# the pages' sources beside them (`_sources/`): the search shows a snippet of each result
html_copy_source = html_show_sourcelink = True
html_js_files = ['search_once.js']  # each name once in the search's results
suppress_warnings = ['mystnb.unknown_mime_type',  # execnb's application/vnd.* outputs have a text/plain or png twin
                    'myst.header']  # show_doc's entries are H3 under the page's H1 title, as on Quarto's pages

# MathJax from the site: the copy sphinx-mathjax-offline ships, only what TeX in HTML-CSS needs (its fonts included)
mathjax_path = 'mathjax/tex-chtml.js'
MATHJAX = Path(__import__('importlib.util').util.find_spec('sphinx-mathjax-offline').origin).parent/'static'/'mathjax'


def copy_mathjax(app, exc):
    if exc is not None: return
    out = Path(app.outdir)/'_static'/'mathjax'
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(MATHJAX/'tex-chtml.js', out)
    shutil.copytree(MATHJAX/'output'/'chtml'/'fonts'/'woff-v2', out/'output'/'chtml'/'fonts'/'woff-v2',
                    dirs_exist_ok=True)


def setup(app): app.connect('build-finished', copy_mathjax)
