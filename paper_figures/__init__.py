"""The papers' figures, regenerated from result tables (published, simulated, measured).

One script per figure (``FIGURES`` in ``paper_figures.make``); each is a pure function
``make(tables) -> (figure, plotted data)`` of ``paper_figures.tables.Tables``. Run them all with
``python -m paper_figures`` (or ``make figures``, which first refreshes the simulated tables).
"""
