module kiln

go 1.26.8
