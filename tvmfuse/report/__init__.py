"""Reports: the offline HTML report and graphs of the fusion groups."""
