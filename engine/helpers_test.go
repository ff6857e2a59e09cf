package engine_test

import "kiln/compile"

var compileVerify = compile.Options{Verify: true}
