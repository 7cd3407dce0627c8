"""SpikingJelly 2.0 model-zoo networks that several tests build, written once (test sizes:
10 classes, IF neurons, VGG's 4096-wide head replaced by one linear layer)."""
import torch.nn as nn
from spikingjelly.activation_based import layer, neuron
from spikingjelly.activation_based.model import (parametric_lif_net, sew_resnet, spiking_resnet,
                                                 spiking_vgg)


def spiking_resnet18():
    return spiking_resnet.spiking_resnet18(spiking_neuron=neuron.IFNode, num_classes=10)


def sew_resnet18_add():
    return sew_resnet.sew_resnet18(spiking_neuron=neuron.IFNode, cnf="ADD", num_classes=10)


def vgg11_bn():
    net = spiking_vgg.spiking_vgg11_bn(spiking_neuron=neuron.IFNode, num_classes=10)
    net.classifier = nn.Sequential(layer.Linear(512 * 7 * 7, 10))  # the 4096-wide head: too big
    return net


def nmnist_net():
    return parametric_lif_net.NMNISTNet(channels=8, spiking_neuron=neuron.IFNode)


#: The spiking transformers and ResNets of SpikingJelly 2.0's model zoo that the export tests
#: deploy, by their short name: their key in ``benchmarks/zoo_deploy.py``'s ``networks()``.
TRANSFORMERS = {"ms_resnet": "ms_resnet.MSResNet", "max_resnet": "ms_resnet.MaxResNet",
                "spikformer": "spikformer.Spikformer",
                "spike_driven_transformer": "spike_driven_transformer.SpikeDrivenTransformer",
                "qkformer": "qkformer.QKFormer"}
