"""Analysis of runs: the polybasic theory (:mod:`theory`), the chain advisor, output quality, the prompt suites
and the CLI's JSON result."""
