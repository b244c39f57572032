"""Example `--model` file for scripts/tune.py: a torch module plus example inputs.

    ./dev python scripts/tune.py --model tests/data/torch_convnet.py --size small
"""
import torch

torch.manual_seed(0)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), dim=-1)


model = ConvNet().eval()
example_inputs = (torch.randn(2, 3, 8, 8),)
