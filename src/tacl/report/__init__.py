"""Result tables (Markdown, CSV, LaTeX) and plots from every finished run, beside published numbers; model cards."""
