// Package testmodel builds small in-memory models for tests of the packages
// that consume models (arch, ir, compile).
package testmodel

import (
	"kiln/model"
	"kiln/tensor"
)

// Zeros returns a model with config c whose every tensor is F32 zeros.
func Zeros(c model.Config) *model.Model {
	m := &model.Model{Path: "tiny", Format: "test", Config: c, Tensors: map[string]*tensor.Tensor{}}
	for _, e := range model.ExpectedTensors(&c) {
		m.Tensors[e.Name] = &tensor.Tensor{Name: e.Name, DType: tensor.F32, Shape: e.Shape, Data: make([]byte, 4*e.Shape.Elements())}
	}
	return m
}
