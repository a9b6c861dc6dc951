"""The command line (``mpicoll COMMAND``, ``python -m mpicoll COMMAND``): bench, calibrate, model,
tune, plot, report, trace. Tools import the library; the library never imports tools."""
