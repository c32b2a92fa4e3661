"""What every stage shares and none owns: the version, the cache folder, the host CPU's
description and the shipped pass pipelines. Imports nothing else of the package."""
