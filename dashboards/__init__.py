"""Dashboards: pure Plotly figure builders and the pages' templates and static files.

``figures`` builds figures from data shaped like the REST API's answers, ``views`` composes a
page's figures and headline numbers, ``html`` renders the autoescaped templates. Nothing here
touches the database or the network; ``service/web`` reads the data and serves the pages.
"""
