import warnings

# pyflyte declares every bool workflow input twice (`--name/--no_name` and `--name/--no-name`,
# flytekit/clis/sdk_in_container/run.py, to_click_option), so click warns that `--name` is used
# more than once each time it builds the command. Both spellings work; the warning is noise.
warnings.filterwarnings("ignore", message=r"The parameter --\w+ is used more than once")
