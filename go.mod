module kiln

go 1.26.8

require (
	github.com/nikolalohinski/gonja/v2 v2.9.1
	github.com/openai/openai-go v1.12.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/tidwall/gjson v1.14.4 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	golang.org/x/text v0.23.0 // indirect
)
