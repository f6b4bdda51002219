#!/bin/sh
exec "$(dirname "$0")/fm" extension "$@"
